package redisserver

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// AddACLUser defines the ACL user name with password and rules (ACL SETUSER rules such as
// "~dlock:*", "+@all", "-publish"). The user is reset and switched on first, so the call
// defines it fully; with no rules it can run no command and touch no key.
func (s *Server) AddACLUser(ctx context.Context, name, password string, rules ...string) error {
	args := []any{"ACL", "SETUSER", name, "reset", "on", ">" + password}
	for _, r := range rules {
		args = append(args, r)
	}
	if err := s.adminClient().Do(ctx, args...).Err(); err != nil {
		return fmt.Errorf("redisserver: ACL SETUSER %s: %w", name, err)
	}
	return nil
}

// ClientFor returns a new go-redis client for this server that authenticates as user with
// password; the caller closes it.
func (s *Server) ClientFor(user, password string) *redis.Client {
	o := s.Options()
	o.Username, o.Password = user, password
	return redis.NewClient(o)
}
