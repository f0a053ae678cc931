"""Data: replay buffers, segment trees, collate, n-step returns and GAE."""
