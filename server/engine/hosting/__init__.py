"""Which worlds this process hosts, its leases, and what its listeners have handled."""
