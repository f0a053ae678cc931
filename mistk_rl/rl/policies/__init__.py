"""Policies with learn, collect and eval modes."""
