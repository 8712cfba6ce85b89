-- release: drop one hold of a reentrant lock; at zero hand the lock to the first live waiter
-- (direct grant: no herd, first come first served) or delete it.
--
-- KEYS[1] lock hash   (see acquire.lua)
-- KEYS[2] op log      hash (see acquire.lua; r:<owner> holds the owner's recent release ids)
-- KEYS[3] fence
-- KEYS[4] queue       sorted set of waiting owners scored by when they joined (ms)
-- KEYS[5] liveness    hash {waiting owner: deadline in ms of server time}
-- ARGV[1] owner id
-- ARGV[2] hold id of the hold being released (the id its acquire used)
-- ARGV[3] op log TTL in ms
-- ARGV[4] notification channel
-- ARGV[5] "1" to release only if the hold exists, never reporting it as already released: the
--         clean-up after an acquire whose reply was lost. It marks the hold id given up
--         (u:<hold id>, acquire.lua), so that acquire, should it reach Redis only now (a command
--         delayed on a dead connection), takes nothing.
-- ARGV[6] grace in ms: TTL of a lock granted to a waiter until it confirms
-- ARGV[7] PUBLISH or SPUBLISH
-- ARGV[8] "1" for a waiter giving up: leave the queue, and pass on a lock granted to it and
--         not yet confirmed, or granted with the hold its wait recorded (ARGV[2], that hold's
--         id, or "")
-- ARGV[9] barging window in ms: a first waiter that has waited less is not granted the lock
--         but woken ("w <owner>") to compete for it with callers outside the queue
-- ARGV[10] mode: "" for a mutex, "r" or "w" for a read-write lock (see lib.lua); a reader's
--         release frees the lock only when it was the last reader
-- ARGV[11] for a waiter giving up: hold ids of its wait's attempts that got no usable reply,
--         whose holds go too, and whose attempts arriving later change nothing
-- ARGV[12], ARGV[13] with mode "s" (a semaphore, lib.lua): its number of permits and how many
--         the hold takes (its queue member's); a holder's release admits the waiters whose
--         permits now fit
--
-- Returns 3 when the lock was handed to a waiter ("g"/"G" published, lib.lua), 2 when it was
-- freed ("w <owner>" published when a waiter is first in line), 1 when one of several holds
-- was dropped or this very release had already been applied (a retry after a lost reply), 0
-- when the hold does not exist (expired, deleted, taken, or the key is not a lock hash) and
-- this call's earlier attempt did not release it. Only the hold named by ARGV[2] is touched
-- (and, for a waiter giving up, the holds named by ARGV[11]).
local owner, mark = ARGV[1], '#' .. ARGV[2]
local mode = ARGV[10] or ''
local sem -- a semaphore's {permits, n} (its holders are readers, lib.lua); nil for a lock
if mode == 's' then
  mode, sem = 'r', {tonumber(ARGV[12]), tonumber(ARGV[13])}
end
local kind = sem and 'sem' or (mode ~= '' and 'rw' or '')
local me = member(mode, owner, sem)

-- hand_on frees the lock: to the first live waiter if any.
local function hand_on()
  local head, waited = first_waiter(KEYS[4], KEYS[5])
  redis.call('DEL', KEYS[1])
  if head and waited >= tonumber(ARGV[9]) then
    leave_queue(KEYS[4], KEYS[5], head)
    local msgs = {}
    grant(KEYS[1], KEYS[3], KEYS[2], KEYS[4], KEYS[5], head, ARGV[6], ARGV[3], msgs)
    notify_all(ARGV[7], ARGV[4], msgs)
    return 3
  end
  -- Every waiter is in the queue (its attempts join it), so with nobody there, nobody is told.
  if head then
    local _, who = split_member(head)
    notify(ARGV[7], ARGV[4], 'w ' .. who)
  end
  return 2
end

-- admit_more lets in the waiters first in line whose permits now fit, when the lock is a
-- semaphore some holder left (a lock's readers leaving admit nobody while others remain).
local function admit_more()
  local f = redis.call('HMGET', KEYS[1], '#k', '#t')
  if f[1] == 'sem' then
    local msgs = {}
    admit(KEYS[1], KEYS[2], KEYS[4], KEYS[5], f[2], ARGV[6], ARGV[3], msgs, nil, true)
    notify_all(ARGV[7], ARGV[4], msgs)
  end
end

-- let_go drops the owner's last hold (mark; nil for a grant not confirmed): a reader leaves
-- the read phase, which frees the lock only when no other reader remains. lock_kind is the
-- lock's "#k".
local function let_go(reading, m, lock_kind)
  if reading and remove_reader(KEYS[1], owner, m, lock_kind == 'sem') > 0 then
    admit_more()
    return 1
  end
  return hand_on()
end

if ARGV[8] == '1' then
  leave_queue(KEYS[4], KEYS[5], me)
  redis.call('HDEL', KEYS[2], 'p:' .. me)
  -- A grant wrote the hold this wait recorded (lib.lua), or the wait's attempt took it
  -- with its reply lost: the waiter never used it. Its owner may hold the lock more than
  -- once (one WithOwner id in several places): then only this hold goes.
  local found, free = drop_holds(KEYS[1], KEYS[2], owner, ARGV[2], nil)
  local found_undone, free_undone = drop_holds(KEYS[1], KEYS[2], owner, ARGV[11], ARGV[3])
  found, free = found or found_undone, free or free_undone
  if free then
    return hand_on()
  elseif found then
    admit_more()
    return 1
  end
  -- A lock granted to us and not yet confirmed is ours to pass on: the grant record names
  -- the lock's current token only while that grant stands (confirming it deletes the record).
  local granted = redis.call('HGET', KEYS[2], 'g:' .. owner)
  local f = lock_fields(KEYS[1], owner, '#t', '#m', '#k')
  if granted then
    redis.call('HDEL', KEYS[2], 'g:' .. owner)
    if f and f[1] and f[2] == granted and (f[3] ~= 'r' or f[1] == '0') then
      return let_go(f[3] == 'r', nil, f[4])
    end
  end
  if redis.call('EXISTS', KEYS[1]) == 0 then
    -- The lock is free (freed for us, first in line, to compete for: "w"): whoever is first
    -- in line now must hear of it, or it sleeps until its next refresh.
    return hand_on()
  end
  if f and f[4] == 'sem' then
    -- A waiter leaving from the head of the queue lets in those behind it whose permits fit.
    admit_more()
  elseif f and f[4] == 'rw' and f[3] == 'r' then
    -- A writer leaving from the head of the queue lets the readers behind it in.
    local msgs = {}
    admit(KEYS[1], KEYS[2], KEYS[4], KEYS[5], f[2], ARGV[6], ARGV[3], msgs)
    notify_all(ARGV[7], ARGV[4], msgs)
  end
  return 0
end

if ARGV[5] == '1' then
  redis.call('HSET', KEYS[2], 'u:' .. ARGV[2], 1)
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end

local f = lock_fields(KEYS[1], mark, owner, '#v', '#k', '#m')
if not f or not f[1] then
  if ARGV[5] == '1' then
    return 0
  end
  -- The hold's field goes only with its release or with the whole lock: it was released
  -- before if it is among the owner's recent releases.
  if released_before(KEYS[2], owner, ARGV[2]) then
    return 1
  end
  return 0
end
if f[3] ~= LAYOUT then
  return layout_error(KEYS[1])
end
if (f[4] or '') ~= kind then
  return kind_error(KEYS[1], kind, f[4])
end
log_release(KEYS[2], owner, ARGV[2], ARGV[3])
if f[2] ~= '1' then
  redis.call('HDEL', KEYS[1], mark)
  redis.call('HINCRBY', KEYS[1], owner, -1)
  return 1
end
return let_go(f[5] == 'r', mark, f[4])
