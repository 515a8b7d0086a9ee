"""Several learner processes for one policy under torchrun: rank context, the store, links, lockstep, reports and the collective update."""
