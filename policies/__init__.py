"""Policy networks, defined once and used by the learner (training) and actor hosts (inference)."""
