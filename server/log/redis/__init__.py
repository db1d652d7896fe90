"""The distributed event log on Redis (and Redis Cluster): appends, reads, leases, wire."""
