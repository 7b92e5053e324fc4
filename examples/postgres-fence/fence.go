package main

import (
	"context"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
)

// Schema is the table the example writes: each row remembers the highest
// token that has written it.
const Schema = `CREATE TABLE IF NOT EXISTS report (
	id    integer PRIMARY KEY,
	body  text    NOT NULL DEFAULT '',
	fence bigint  NOT NULL DEFAULT 0
)`

// WriteReport writes body into row id under token. The row takes it only if
// no higher token has written it: a holder whose lease ended and was replaced
// changes nothing, however late its write arrives. An equal token passes,
// because one holder writes many times under one token.
//
// It answers whether the row was written.
func WriteReport(ctx context.Context, db *pgx.Conn, id int, body string, token uint64) (bool, error) {
	if token > math.MaxInt64 {
		return false, fmt.Errorf("token %d does not fit a bigint column", token)
	}
	tag, err := db.Exec(ctx,
		`UPDATE report SET body = $1, fence = $2 WHERE id = $3 AND fence <= $2`,
		body, int64(token), id)
	if err != nil {
		return false, fmt.Errorf("writing report %d: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}
