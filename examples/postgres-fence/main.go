// Command postgres-fence writes a report row under a lock, fenced by the
// lock's token, so a holder that outlived its lease cannot overwrite the
// work of the holder that replaced it.
//
//	postgres-fence --db postgres://... --server http://queen-locks.queen-locks.svc:6632 --id 1 "report body"
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/queen-locks/queen-locks/handle"
)

func main() {
	dsn := flag.String("db", os.Getenv("DATABASE_URL"), "PostgreSQL connection string")
	server := flag.String("server", os.Getenv("QUEEN_LOCKS_URL"), "the queen-locks route")
	id := flag.Int("id", 1, "report row to write")
	flag.Parse()
	if err := run(context.Background(), *dsn, *server+"/api/v1/locks", *id, flag.Arg(0)); err != nil {
		fmt.Fprintln(os.Stderr, "postgres-fence:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dsn, route string, id int, body string) error {
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer db.Close(ctx)
	if _, err := db.Exec(ctx, Schema); err != nil {
		return err
	}
	if _, err := db.Exec(ctx, `INSERT INTO report (id) VALUES ($1) ON CONFLICT DO NOTHING`, id); err != nil {
		return err
	}
	// No token given: the handle reads the projected token of audience
	// queen-locks (QUEEN_LOCKS_TOKEN_FILE, or its default path) when there
	// is one, as the route requires; a local route with --auth=none needs
	// none.
	c := handle.New(handle.HTTP(route, handle.HTTPOptions{}))
	lock := c.Lock(fmt.Sprintf("report-%d", id), 30*time.Second)
	acquired, err := lock.Run(ctx, func(ctx context.Context) error {
		// Read the token when writing: it changes at every renew.
		ok, err := WriteReport(ctx, db, id, body, lock.Token())
		if err == nil && !ok {
			err = fmt.Errorf("a newer holder has written report %d; this write was refused", id)
		}
		return err
	}, handle.Wait(10*time.Second))
	if err == nil && !acquired {
		err = fmt.Errorf("report %d is being written elsewhere", id)
	}
	return err
}
