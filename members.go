package dlock

import (
	"context"
	"fmt"
	"sync"
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
	ctx, cancel := context.WithTimeout(c.cleanup, abandonTimeout)
	defer cancel()
	_, errs := releaseAll(ctx, releasing)
	for i, h := range releasing {
		h.end(nil, false)
		if errs[i] != nil {
			h.releaseLater()
		}
	}
}

// releaseAll runs the release of every hold at once (members live on their own slots, each a
// round trip) and returns each one's answer.
func releaseAll(ctx context.Context, hs []*hold) ([]int, []error) {
	ns, errs := make([]int, len(hs)), make([]error, len(hs))
	var wg sync.WaitGroup
	for i, h := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ns[i], errs[i] = h.release(ctx)
		}()
	}
	wg.Wait()
	return ns, errs
}

// unlockAll releases every member hold of a MultiLock lease: Unlock's work when the lease has
// several holds.
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

// releaseMembers runs the releases of a MultiLock lease's member holds hs and ends the lease
// by their answers: lost if a member was (lost, or a release answering that the hold is gone).
// A release that got no answer is retried in the background, and at once by a later Unlock
// (the lease keeps those holds) unless a member was lost; its error is returned either way.
func (l *Lease) releaseMembers(ctx context.Context, hs []*hold, lost error) error {
	ns, rerrs := releaseAll(ctx, hs)
	var errs []error
	var failed []*hold
	for i, h := range hs {
		switch {
		case rerrs[i] != nil:
			h.end(nil, false)
			h.releaseLater()
			failed = append(failed, h)
			errs = append(errs, redisErr("unlock", h.name, rerrs[i]))
		case ns[i] == 0:
			gone := leaseLost(h.name, errKeyGone)
			h.end(gone, false)
			lost = cmpOr(lost, gone)
		default:
			h.end(nil, false)
		}
	}
	retrying := "dlock retries the release in the background; the lock expires within its TTL otherwise"
	if lost != nil {
		l.finish(lost, true)
		if len(errs) > 0 {
			return fmt.Errorf("%w: %w; %w (%s)", ErrNotHeld, lost, join(errs...), retrying)
		}
		return fmt.Errorf("%w: %w", ErrNotHeld, lost)
	}
	if len(failed) > 0 {
		l.mu.Lock()
		l.retry = failed
		l.mu.Unlock()
		l.finish(nil, false) // ended locally; a later Unlock retries the failed releases at once
		return fmt.Errorf("%w (%s)", join(errs...), retrying)
	}
	l.finish(nil, true)
	return nil
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
