"""What the learner serves to actor hosts: the control socket, the ingest and its row checks, registered senders, host sizing and routing, weights, addresses."""
