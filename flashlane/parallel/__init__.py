"""Tensor parallel over torch.distributed: the group (group.py), the sharding plan applied
to a built model (plan.py), rank 0's rounds replayed on the other ranks (replay.py) and the
processes that start them (launch.py). The model files hold no process management: a
sharded layer only calls the `combine` its plan gave it."""
