package dlock

import (
	"context"
	"fmt"
	"sync"

	"github.com/dlock-go/dlock/internal/scripts"
)

// A lease over several holds, a MultiLock's members or a Redlock's masters: how they are
// given back, released together and ended when the lease can no longer stand.

// giveBack releases holds nobody was handed a lease on (a MultiLock that did not get every
// member, or lost one), retrying in the background when Redis gives no answer.
func (c *Client) giveBack(holds []*hold) {
	var releasing []*hold
	for _, h := range holds {
		if h != nil && h.beginRelease() {
			releasing = append(releasing, h)
		}
	}
	if len(releasing) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(c.cleanup, abandonTimeout)
	defer cancel()
	groups := byClient(releasing)
	var wg sync.WaitGroup
	for _, group := range groups {
		// Each hold's own Client runs its release: a Redlock's holds are on several masters.
		give := func() {
			_, errs := group[0].c.releaseBatch(ctx, group)
			for i, h := range group {
				h.end(nil, false)
				if errs[i] != nil {
					h.releaseLater()
				}
			}
		}
		if len(groups) == 1 {
			give() // a MultiLock's members: no goroutine needed
			continue
		}
		wg.Go(give)
	}
	wg.Wait()
}

// byClient splits holds by the Client they were taken on (a Redlock's masters each have
// theirs; a MultiLock's members share one), in order of first appearance.
func byClient(hs []*hold) [][]*hold {
	var groups [][]*hold
	at := map[*Client]int{}
	for _, h := range hs {
		i, ok := at[h.c]
		if !ok {
			i = len(groups)
			at[h.c] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], h)
	}
	return groups
}

// releaseBatch runs the releases of hs, holds taken on c, in one round trip per node (runBatch) and
// returns each one's answer, as hold.release does.
func (c *Client) releaseBatch(ctx context.Context, hs []*hold) ([]int, []error) {
	if len(hs) == 1 {
		n, err := hs[0].release(ctx)
		return []int{n}, []error{err}
	}
	keys, args := make([][]string, len(hs)), make([][]any, len(hs))
	for i, h := range hs {
		keys[i], args[i] = releaseCall(c, h.ref(), releaseNormal, nil)
	}
	ns, errs := make([]int, len(hs)), make([]error, len(hs))
	for i, cmd := range c.runBatch(ctx, scripts.Release, keys, args) {
		ns[i], errs[i] = cmd.Int()
	}
	return ns, errs
}

// unlockAll releases every hold of a lease over several holds (a MultiLock's members, a
// Redlock's masters): Unlock's work then.
func (l *Lease) unlockAll(ctx context.Context) error {
	var lost error
	var releasing []*hold
	for _, h := range l.hd.holds() {
		if !h.beginRelease() {
			lost = cmpOr(lost, h.lossErr())
			continue
		}
		releasing = append(releasing, h)
	}
	return l.releaseMembers(ctx, releasing, lost)
}

// releaseMembers runs the releases of holds hs of a lease over several holds and ends the
// lease by their answers. The lease was lost (cause lost, if given) when fewer of its holds
// than its holding needs (every MultiLock member, a Redlock quorum) were still held at the
// release: the holds released now or by an earlier Unlock, plus those whose release got no
// answer. A release that got no answer is retried in the background; while the holds released
// are short of the need, a later Unlock retries them at once (the lease keeps them) and the
// error is returned.
func (l *Lease) releaseMembers(ctx context.Context, hs []*hold, lost error) error {
	l.mu.Lock()
	released := l.released
	l.mu.Unlock()
	released, failed, errs, rlost := releaseHolds(ctx, hs, released, l.hd.need)
	lost = cmpOr(lost, rlost)
	l.mu.Lock()
	l.released = released
	l.mu.Unlock()
	retrying := "dlock retries the release in the background; the lock expires within its TTL otherwise"
	switch {
	case released+len(failed) < l.hd.need:
		lost = cmpOr(lost, leaseLost(l.ref.name, errKeyGone))
		l.finish(lost, true)
		if len(errs) > 0 {
			return fmt.Errorf("%w: %w; %w (%s)", ErrNotHeld, lost, join(errs...), retrying)
		}
		return fmt.Errorf("%w: %w", ErrNotHeld, lost)
	case released < l.hd.need:
		l.mu.Lock()
		l.retry = failed
		l.mu.Unlock()
		l.finish(nil, false) // ended locally; a later Unlock retries the failed releases at once
		return fmt.Errorf("%w (%s)", join(errs...), retrying)
	}
	l.finish(nil, true) // enough released: the rest are retried in the background
	return nil
}

// releaseHolds runs the releases of hs at once (those of one Client in one round trip per
// node), each hold ended by its answer (a release that got no answer is retried in the
// background), and collects the answers until released (the count so far) reaches need: a
// straggler, a silent Redlock master, settles itself later. It returns the new count, the
// holds whose release got no answer and why, and the loss of a hold Redis no longer had.
func releaseHolds(ctx context.Context, hs []*hold, released, need int) (int, []*hold, []error, error) {
	type result struct {
		h   *hold
		n   int
		err error
	}
	// settle ends h by its release's answer (a straggler settles itself after we returned).
	settle := func(h *hold, n int, err error) {
		switch {
		case err != nil:
			h.end(nil, false)
			h.releaseLater()
		case n == 0:
			h.end(leaseLost(h.name, errKeyGone), false)
		default:
			h.end(nil, false)
		}
	}
	results := make(chan result, len(hs))
	for _, group := range byClient(hs) {
		c := group[0].c
		run := func() {
			ns, errs := c.releaseBatch(ctx, group)
			for i, h := range group {
				settle(h, ns[i], errs[i])
				results <- result{h, ns[i], errs[i]}
			}
		}
		if !c.goBackground() {
			run() // closing: Close skips a hold being released, so this call must finish it
			continue
		}
		go func() {
			defer c.wg.Done()
			run()
		}()
	}
	var errs []error
	var failed []*hold
	var lost error
	for range hs {
		if released >= need {
			break
		}
		r := <-results
		switch {
		case r.err != nil:
			failed = append(failed, r.h)
			errs = append(errs, redisErr("unlock", r.h.name, r.err))
		case r.n == 0:
			lost = cmpOr(lost, leaseLost(r.h.name, errKeyGone))
		default:
			released++
		}
	}
	return released, failed, errs, lost
}

// lostMember ends a MultiLock holding whose member was lost: the other members, still held in
// Redis, are released so nobody waits for them until their TTL.
func (hd *holding) lostMember() {
	if len(hd.more) == 0 {
		return
	}
	c := hd.h.c
	if !c.goBackground() {
		return // Close releases them
	}
	go func() {
		defer c.wg.Done()
		c.giveBack(hd.holds())
	}()
}
