"""League training: players, payoff, prioritized fictitious self-play (PFSP), snapshots."""
