"""A cluster's life: spec, up/down, status, autostop, the cost ledger, inventory, node facts."""
