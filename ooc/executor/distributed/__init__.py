"""Multi-process training by model averaging (torch.distributed): partition
assignment, the averaging schedule, worker heartbeats and the launcher."""
