package dlock

// Tracked exposes, to tests only, the moment a lease's key is tracked for push loss detection.
func Tracked(l *Lease) <-chan struct{} { return l.h.tracked }
