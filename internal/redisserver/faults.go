package redisserver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// KillClients runs CLIENT KILL with filter (e.g. "TYPE", "pubsub", or "USER", "x", or
// "ID", "42"; the connection of this package's own client is skipped) and returns how many
// connections the server closed. A single argument is the old form, an addr:port.
func (s *Server) KillClients(ctx context.Context, filter ...string) (int, error) {
	if len(filter) == 0 {
		return 0, fmt.Errorf("redisserver: KillClients needs a filter")
	}
	args := []any{"CLIENT", "KILL"}
	for _, f := range filter {
		args = append(args, f)
	}
	res, err := s.adminClient().Do(ctx, args...).Result()
	if err != nil {
		return 0, fmt.Errorf("redisserver: CLIENT KILL %s: %w", strings.Join(filter, " "), err)
	}
	if n, ok := res.(int64); ok {
		return int(n), nil
	}
	return 1, nil // the old form replies OK for the one connection it closed
}

// KillClientsNamed closes every connection whose client name (CLIENT SETNAME, go-redis's
// Options.ClientName) equals name and returns how many it closed.
func (s *Server) KillClientsNamed(ctx context.Context, name string) (int, error) {
	return s.KillClientsFlagged(ctx, name, "")
}

// KillClientsFlagged closes every connection named name whose CLIENT LIST flags contain flag
// ("" for any; "t" a connection with tracking on, "P" a pub/sub one) and returns how many it
// closed.
func (s *Server) KillClientsFlagged(ctx context.Context, name, flag string) (int, error) {
	list, err := s.adminClient().ClientList(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("redisserver: CLIENT LIST: %w", err)
	}
	killed := 0
	for _, line := range strings.Split(list, "\n") {
		var id, flags string
		named := false
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "id="); ok {
				id = v
			} else if v, ok := strings.CutPrefix(f, "flags="); ok {
				flags = v
			} else if f == "name="+name {
				named = true
			}
		}
		if !named || id == "" || !strings.Contains(flags, flag) {
			continue
		}
		n, err := s.KillClients(ctx, "ID", id)
		if err != nil {
			return killed, err
		}
		killed += n // 0 when the connection closed meanwhile
	}
	return killed, nil
}

// Role returns the first element of the server's ROLE reply: "master", "slave" (a replica)
// or "sentinel".
func (s *Server) Role(ctx context.Context) (string, error) {
	r, err := s.role(ctx)
	return r.role, err
}

// roleReply is a parsed ROLE reply.
type roleReply struct {
	role   string
	master string // a replica's master, host:port
	state  string // a replica's link state: "connected", "sync", "connecting", ...
}

func (s *Server) role(ctx context.Context) (roleReply, error) {
	v, err := s.adminClient().Do(ctx, "ROLE").Slice()
	if err != nil {
		return roleReply{}, err
	}
	if len(v) == 0 {
		return roleReply{}, fmt.Errorf("redisserver: empty ROLE reply from %s", s.Addr)
	}
	r := roleReply{role: fmt.Sprint(v[0])}
	if r.role == "slave" && len(v) >= 4 {
		r.master = fmt.Sprintf("%v:%v", v[1], v[2])
		r.state = fmt.Sprint(v[3])
	}
	return r, nil
}

// AwaitReplicated waits until replica has applied s's replication stream up to s's offset at
// the call, so a kill of s afterwards loses no write made before it. Redis replicates
// asynchronously: without this a forced failover may promote a replica that lacks the last
// writes, which is a scenario of its own (lost writes), not only a failover.
func (s *Server) AwaitReplicated(replica *Server, timeout time.Duration) error {
	ctx := context.Background()
	info, err := s.adminClient().Info(ctx, "replication").Result()
	if err != nil {
		return fmt.Errorf("redisserver: INFO replication of %s: %w", s.Addr, err)
	}
	target, err := strconv.ParseInt(infoField(info, "master_repl_offset"), 10, 64)
	if err != nil {
		return fmt.Errorf("redisserver: %s: master_repl_offset: %w", s.Addr, err)
	}
	return poll(timeout, 2*time.Millisecond, func() (bool, string) {
		info, err := replica.adminClient().Info(ctx, "replication").Result()
		if err != nil {
			return false, err.Error()
		}
		if infoField(info, "master_link_status") != "up" {
			return false, "link " + infoField(info, "master_link_status")
		}
		got, _ := strconv.ParseInt(infoField(info, "slave_repl_offset"), 10, 64)
		return got >= target, fmt.Sprintf("applied %d of %d", got, target)
	}, "redisserver: "+replica.Addr+" did not catch up with "+s.Addr)
}

// infoField returns the value of field in an INFO reply, or "".
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return ""
}

// FailSaves makes the server's next background save fail with stop-writes-on-bgsave-error on,
// so that it answers writes, scripts and PING with MISCONF until a save succeeds; it returns
// once PING answers so (at most 10 s). The server must have been started with
// "--enable-protected-configs", "yes" in Config.Args (it moves the save's dir to one that
// is then removed).
func (s *Server) FailSaves(ctx context.Context) error {
	dir := filepath.Join(s.dir, "gone")
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("redisserver: FailSaves: %w", err)
	}
	rdb := s.adminClient()
	for _, kv := range [][2]string{{"save", "3600 1"}, {"stop-writes-on-bgsave-error", "yes"}, {"dir", dir}} {
		if err := rdb.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			return fmt.Errorf("redisserver: FailSaves: CONFIG SET %s: %w", kv[0], err)
		}
	}
	if err := os.Remove(dir); err != nil { // the save cannot write its file
		return fmt.Errorf("redisserver: FailSaves: %w", err)
	}
	rdb.BgSave(ctx)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err := rdb.Ping(ctx).Err(); err != nil && strings.HasPrefix(err.Error(), "MISCONF") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redisserver: FailSaves: PING not answered with MISCONF after 10 s")
		}
	}
}
