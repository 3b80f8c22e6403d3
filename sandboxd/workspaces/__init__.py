"""A session's files on the host: quota-limited tmpfs workspaces and their mount helper,
measuring, re-owning and removing what sandboxed code wrote, and raw file transfers."""
