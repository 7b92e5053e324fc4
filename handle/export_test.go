package handle

import "time"

// HTTPWith is HTTP with projected as the default token file and now as
// the clock that times the token file's re-reads.
func HTTPWith(url string, o HTTPOptions, projected string, now func() time.Time) Transport {
	return newHTTP(url, o, projected, now)
}

// TokenOf is the bearer token an HTTP transport would send now.
func TokenOf(tr Transport) (string, error) { return tr.(*httpTransport).token() }
