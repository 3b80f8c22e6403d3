"""Small idioms every floor shares, each defined once: deadlines, the stop's bound, caps
reserved before any await, showing untrusted text, and the one time format."""
