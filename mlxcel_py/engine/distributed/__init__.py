"""One model over the ranks of an `mx.distributed` group: joining the group, the link that
carries records and tokens between ranks, and the runners that execute records on every rank."""
