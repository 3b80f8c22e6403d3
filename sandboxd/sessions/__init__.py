"""Sessions: their records and workspaces, their calls as their end sees them, their kernels
seen from the service, and what a restarted daemon keeps of them."""
