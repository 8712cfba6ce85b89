package redisserver

import (
	"context"
	"fmt"
	"strings"
)

// A SlotMigration is one Cluster slot being moved from its master (Src) to another (Dst), as
// resharding does: for tests of ASK during a migration and MOVED after it.
type SlotMigration struct {
	Slot         int
	Src, Dst     *Server
	c            *Cluster
	srcID, dstID string
}

// MigrateSlotOf starts moving the slot of key to another master (CLUSTER SETSLOT IMPORTING on
// the target, MIGRATING on the source) and moves key itself: from then on the source answers
// ASK for it, and the target serves it to a client that sends ASKING first.
func (c *Cluster) MigrateSlotOf(ctx context.Context, key string) (*SlotMigration, error) {
	if len(c.nodes) == 0 {
		return nil, fmt.Errorf("redisserver: empty cluster")
	}
	slot, err := c.nodes[0].adminClient().ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return nil, fmt.Errorf("redisserver: slot of %q: %w", key, err)
	}
	m := &SlotMigration{Slot: int(slot), c: c, Src: c.MasterForSlot(int(slot))}
	if m.Src == nil {
		return nil, fmt.Errorf("redisserver: no master serves slot %d", slot)
	}
	for _, s := range c.Masters() {
		if s != m.Src {
			m.Dst = s
			break
		}
	}
	if m.Dst == nil {
		return nil, fmt.Errorf("redisserver: no other master to move slot %d to", slot)
	}
	if m.srcID, err = m.Src.adminClient().ClusterMyID(ctx).Result(); err != nil {
		return nil, err
	}
	if m.dstID, err = m.Dst.adminClient().ClusterMyID(ctx).Result(); err != nil {
		return nil, err
	}
	if err := m.Dst.adminClient().Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", m.srcID).Err(); err != nil {
		return nil, fmt.Errorf("redisserver: SETSLOT IMPORTING: %w", err)
	}
	if err := m.Src.adminClient().Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", m.dstID).Err(); err != nil {
		return nil, fmt.Errorf("redisserver: SETSLOT MIGRATING: %w", err)
	}
	return m, m.move(ctx, key)
}

// move moves keys from the source to the target.
func (m *SlotMigration) move(ctx context.Context, keys ...string) error {
	host, port, _ := strings.Cut(m.Dst.Addr, ":")
	for _, k := range keys {
		if err := m.Src.adminClient().Do(ctx, "MIGRATE", host, port, "", 0, 5000, "KEYS", k).Err(); err != nil {
			return fmt.Errorf("redisserver: MIGRATE %q: %w", k, err)
		}
	}
	return nil
}

// Finish moves the slot's remaining keys and gives the slot to the target on every master:
// from then on the source answers MOVED for it.
func (m *SlotMigration) Finish(ctx context.Context) error {
	for {
		keys, err := m.Src.adminClient().ClusterGetKeysInSlot(ctx, m.Slot, 100).Result()
		if err != nil {
			return fmt.Errorf("redisserver: GETKEYSINSLOT: %w", err)
		}
		if len(keys) == 0 {
			break
		}
		if err := m.move(ctx, keys...); err != nil {
			return err
		}
	}
	for _, s := range m.c.Masters() {
		if err := s.adminClient().Do(ctx, "CLUSTER", "SETSLOT", m.Slot, "NODE", m.dstID).Err(); err != nil {
			return fmt.Errorf("redisserver: SETSLOT NODE on %s: %w", s.Addr, err)
		}
	}
	return nil
}
