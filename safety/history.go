package main

// An op is one recorded operation of a client process, with call and return times on
// CLOCK_MONOTONIC.
type op struct {
	Client int    `json:"c"`
	Kind   string `json:"k"` // "acquire", "write", "incr", "release"
	Call   int64  `json:"call"`
	Return int64  `json:"ret"`
	Token  uint64 `json:"tok,omitempty"`
	// Result: "ok", "fail" (refused: not obtained, stale token, not held) or "unknown" (the
	// reply was lost: the operation may or may not have taken effect).
	Result string `json:"res"`
	// Until is the end of the lease's validity window as the client knows it: the acquire's
	// call time + TTL × (1 − drift), moved by the client's own renewals (acquire ops only).
	Until int64 `json:"until,omitempty"`
	// Lost is when the client saw the lease end without its release (Done), 0 if it did not.
	Lost int64 `json:"lost,omitempty"`
	// Value is what a read-modify-write read (incr ops).
	Value int64 `json:"v,omitempty"`
}
