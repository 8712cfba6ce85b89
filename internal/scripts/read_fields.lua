-- read_fields: read fields of a hash of dlock's state where only the master answers. The Go side
-- runs it instead of HMGET when the Client's go-redis client sends read commands to replicas
-- (a Cluster client with ReadOnly, RouteByLatency or RouteRandomly): a replica may lag behind
-- the master, and a lease may end, or a latch open, only on the current master's word. A
-- script is sent to the master, and its "#!lua" line (without no-writes) makes a replica
-- refuse it; allow-oom lets it read on a master at maxmemory.
--
-- KEYS[1] the key
-- ARGV    the fields
--
-- Returns {EXISTS of the key, value of the first field, ...}, nil for a missing field; a key
-- of another type is an error (WRONGTYPE), as it is for HMGET.
local v = redis.call('HMGET', KEYS[1], unpack(ARGV))
return {redis.call('EXISTS', KEYS[1]), unpack(v)}
