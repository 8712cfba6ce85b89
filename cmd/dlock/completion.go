package main

import (
	"context"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/spf13/cobra"
)

// Shell completion comes from cobra: `dlock completion bash|zsh|fish` prints the script, and
// the shell calls back `dlock __complete ARGS...` for each completion. A completer adds
// the lock names Redis has state for.

// completionTimeout bounds the Redis round trip of one completion: a shell waits on it.
const completionTimeout = time.Second

// A completer completes lock names for the command line words (`dlock __complete ...`).
type completer struct{ words []string }

// lockNames completes a NAME argument with the locks that have state in Redis (--redis,
// else $REDIS_URL; none if neither answers within completionTimeout). After run's --, it
// completes the command as a file.
func (cp *completer) lockNames(common *commonFlags) cobra.CompletionFunc {
	return func(c *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if c.Name() == "run" {
			if cp.dashBeforeLastWord() {
				return nil, cobra.ShellCompDirectiveDefault
			}
			if len(args) > 0 || c.Flags().Changed("lock") {
				return []cobra.Completion{"--"}, cobra.ShellCompDirectiveNoFileComp
			}
		} else if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return lockNames(common, toComplete), cobra.ShellCompDirectiveNoFileComp
	}
}

// flagLockNames completes a flag's value (run --lock) with lock names.
func (cp *completer) flagLockNames(common *commonFlags) cobra.CompletionFunc {
	return func(_ *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return lockNames(common, toComplete), cobra.ShellCompDirectiveNoFileComp
	}
}

// dashBeforeLastWord reports whether the words being completed (dlock __complete ...
// WORD) have a -- before WORD. Cobra's ArgsLenAtDash cannot say: completion parses the
// flags with a -- of its own appended.
func (cp *completer) dashBeforeLastWord() bool {
	w := cp.words
	return len(w) > 1 && slices.Contains(w[1:len(w)-1], "--")
}

// lockNames lists the names that start with prefix; nil on any error or after
// completionTimeout, as a shell's completion should show nothing rather than an error or a
// hang (go-redis does not bound a read by the context's deadline: a stopped Redis would hold
// the shell for its own 3 s read timeout and more).
func lockNames(common *commonFlags, prefix string) []cobra.Completion {
	got := make(chan []cobra.Completion, 1)
	go func() { got <- readLockNames(common, prefix) }()
	select {
	case names := <-got:
		return names
	case <-time.After(completionTimeout):
		return nil // the process exits next: the read is abandoned, not leaked for long
	}
}

// readLockNames reads the names that start with prefix from Redis.
func readLockNames(common *commonFlags, prefix string) []cobra.Completion {
	url := os.Getenv("REDIS_URL")
	if len(common.redis) > 0 {
		url = common.redis[0] // a Redlock's first master has the names too
	}
	if url == "" {
		return nil
	}
	rdb, err := openURL(url)
	if err != nil {
		return nil
	}
	defer rdb.Close()
	dl := dlock.New(rdb, dlock.WithKeyPrefix(common.prefix))
	defer dl.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
	defer cancel()
	// A glob character typed in prefix widens the match; the HasPrefix filter narrows it back.
	locks, err := dl.Locks(ctx, prefix+"*")
	if err != nil {
		return nil
	}
	names := make([]cobra.Completion, 0, len(locks))
	for _, l := range locks {
		if strings.HasPrefix(l.Name, prefix) {
			names = append(names, l.Name)
		}
	}
	return names
}
