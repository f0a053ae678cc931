"""Two-player board games read off PettingZoo observations, and built-in opponents for them."""
