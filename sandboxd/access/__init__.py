"""Who may call and how often: client tokens, rate limits and failed-authentication
accounting, and the approvals a person gives to a gated call."""
