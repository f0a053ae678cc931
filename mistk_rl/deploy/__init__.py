"""Deployment: starting, waiting for and stopping service processes (`launch`), and placing
them on a Ray cluster (`cluster`; Ray is imported only when used)."""
