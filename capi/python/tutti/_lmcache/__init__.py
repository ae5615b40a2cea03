"""LMCache integration internals (see tutti.lmcache)."""
