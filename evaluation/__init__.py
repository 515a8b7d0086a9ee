"""Evaluation tools that train nothing: batched matches (arena), Bradley-Terry ratings, the ELO tournament."""
