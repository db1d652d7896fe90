"""One contract suite run against every backend: the event log and the bus, embedded and on Redis."""
