"""One widget per module; each renders a domain snapshot, never a raw dict."""
