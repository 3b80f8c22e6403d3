"""What the daemon holds on its host and the few OS facts it reads: the state directory's
lock, sandbox uids (claimed host-wide), free space, /proc, the C heap, HTTP over a unix socket."""
