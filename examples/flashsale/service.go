package main

// The shop: POST /buy?user=ID places at most one order per user while stock lasts. Stock is a
// Redis counter, orders are rows in PostgreSQL. Which lock (if any) guards a user's
// check-then-order is the Guard's business (variants.go); the handler is the same for all.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// schema creates the shop's tables in a schema of their own, so a PG_URL pointing at a
// real database never has its own tables truncated. orders deliberately has no unique
// constraint on user_id: only the lock stands between a user's concurrent clicks and a
// second order, which is what this example measures.
const schema = `
CREATE SCHEMA IF NOT EXISTS flashsale;
CREATE TABLE IF NOT EXISTS flashsale.orders (
	user_id bigint      NOT NULL,
	item    int         NOT NULL,
	token   bigint,                 -- the lock's fencing token; NULL for locks without one
	created timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS orders_user_id ON flashsale.orders (user_id); -- not unique, on purpose
CREATE TABLE IF NOT EXISTS flashsale.user_tokens (user_id bigint PRIMARY KEY, token bigint NOT NULL);
CREATE TABLE IF NOT EXISTS flashsale.users (user_id bigint PRIMARY KEY);
`

// takeItem decrements the stock and returns the number left (the sold item's number), or -1
// when none is left, in one script so that concurrent buyers can never take it below zero.
var takeItem = redis.NewScript(`
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n <= 0 then return -1 end
return redis.call('DECR', KEYS[1])
`)

// Service is the flash-sale HTTP service.
type Service struct {
	DB       *pgxpool.Pool
	RDB      *redis.Client
	Guard    Guard         // the lock around each user's check-then-order
	StockKey string        // the Redis counter of items left
	LockWait time.Duration // how long a click waits for its user's lock before 503
}

// Setup creates the schema if missing.
func Setup(ctx context.Context, db *pgxpool.Pool) error {
	_, err := db.Exec(ctx, schema)
	return err
}

// Reset empties the orders and puts items in stock: every variant starts from a fresh sale.
func (s *Service) Reset(ctx context.Context, items int) error {
	if _, err := s.DB.Exec(ctx, "TRUNCATE flashsale.orders, flashsale.user_tokens, flashsale.users"); err != nil {
		return err
	}
	return s.RDB.Set(ctx, s.StockKey, items, 0).Err()
}

// ServeHTTP answers POST /buy?user=ID: 200 ordered, 409 already ordered, 410 sold out,
// 503 lock not obtained or another error.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/buy" {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	user, err := strconv.ParseInt(r.URL.Query().Get("user"), 10, 64)
	if err != nil {
		http.Error(w, "user must be an integer id", http.StatusBadRequest)
		return
	}
	code, err := s.buy(r.Context(), user)
	if err != nil {
		http.Error(w, err.Error(), code)
		return
	}
	w.WriteHeader(code)
	fmt.Fprintln(w, http.StatusText(code))
}

// errLost marks an order the fence refused: a newer holder of the user's lock exists, so
// this request's lock was lost while it worked.
var errLost = errors.New("lock lost: refused by the fencing token")

// buy places user's order under the user's lock and returns the HTTP status.
func (s *Service) buy(ctx context.Context, user int64) (int, error) {
	wait, cancel := context.WithTimeout(ctx, s.LockWait)
	defer cancel()
	work, token, unlock, err := s.Guard.Lock(wait, user)
	if err != nil {
		return http.StatusServiceUnavailable, fmt.Errorf("lock not obtained: %w", err)
	}
	defer unlock()
	work, cancelWork := context.WithTimeout(work, 10*time.Second) // a stuck database ends the click
	defer cancelWork()

	tx, err := s.DB.Begin(work)
	if err != nil {
		return http.StatusServiceUnavailable, err
	}
	defer tx.Rollback(context.Background()) // after Commit: a no-op
	if err := s.Guard.InTx(work, tx, user); err != nil {
		return http.StatusServiceUnavailable, err
	}
	if token != 0 {
		if err := fence(work, tx, user, token); err != nil {
			return http.StatusServiceUnavailable, err
		}
	}
	// The check and the insert below are separate statements, as in any real shop: without a
	// lock, two clicks of one user both pass the check before either inserts.
	var ordered bool
	if err := tx.QueryRow(work, "SELECT EXISTS (SELECT 1 FROM flashsale.orders WHERE user_id = $1)", user).Scan(&ordered); err != nil {
		return http.StatusServiceUnavailable, err
	}
	if ordered {
		return http.StatusConflict, nil
	}
	item, err := takeItem.Run(work, s.RDB, []string{s.StockKey}).Int64()
	if err != nil {
		return http.StatusServiceUnavailable, err
	}
	if item < 0 {
		return http.StatusGone, nil
	}
	var tok *int64 // NULL for locks without a fencing token
	if token != 0 {
		tok = &token
	}
	_, err = tx.Exec(work, "INSERT INTO flashsale.orders (user_id, item, token) VALUES ($1, $2, $3)", user, item, tok)
	if err == nil {
		err = tx.Commit(work)
	}
	if err != nil {
		// The item was taken but no order recorded: give it back so none is lost.
		if perr := s.RDB.Incr(context.Background(), s.StockKey).Err(); perr != nil {
			err = errors.Join(err, perr)
		}
		return http.StatusServiceUnavailable, err
	}
	return http.StatusOK, nil
}

// fence records token as the user's latest and fails with errLost unless it is greater than
// every token recorded before, in the order's own transaction: the order is written only by
// the newest holder of the user's lock, even when an older holder (paused past its lease, its
// lock expired and taken by another click) wakes up and carries on. It runs before the
// check, so the check sees every order an older holder committed.
//
// Why a user_tokens row rather than `INSERT ... WHERE NOT EXISTS (... token >= $token)`: under
// READ COMMITTED two transactions in flight at once both see no such row and both insert.
// The upsert takes the user's user_tokens row lock; a concurrent holder waits for it and its
// WHERE is then re-checked against the committed token, so exactly one of them gets through.
func fence(ctx context.Context, tx pgx.Tx, user, token int64) error {
	tag, err := tx.Exec(ctx, `
		INSERT INTO flashsale.user_tokens (user_id, token) VALUES ($1, $2)
		ON CONFLICT (user_id) DO UPDATE SET token = EXCLUDED.token
		WHERE flashsale.user_tokens.token < EXCLUDED.token`, user, token)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errLost
	}
	return nil
}

// Audit is what the sale left behind.
type Audit struct {
	Orders    int // rows in orders
	Users     int // distinct users with an order
	Doubles   int // users with two orders or more
	Items     int // distinct item numbers sold
	StockLeft int // the Redis counter at the end
}

// Conserved reports whether no item was sold twice or lost: every item put on sale is either
// in exactly one order or still in stock.
func (a Audit) Conserved(items int) bool {
	return a.Orders+a.StockLeft == items && a.Items == a.Orders
}

// Audit counts the orders and reads the stock left.
func (s *Service) Audit(ctx context.Context) (Audit, error) {
	var a Audit
	err := s.DB.QueryRow(ctx, `
		SELECT count(*), count(DISTINCT user_id), count(DISTINCT item),
		       (SELECT count(*) FROM (SELECT 1 FROM flashsale.orders GROUP BY user_id HAVING count(*) >= 2) d)
		FROM flashsale.orders`).Scan(&a.Orders, &a.Users, &a.Items, &a.Doubles)
	if err != nil {
		return a, err
	}
	a.StockLeft, err = s.RDB.Get(ctx, s.StockKey).Int()
	return a, err
}
