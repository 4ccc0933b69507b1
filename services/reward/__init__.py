"""The reward service (RollArt's serverless reward): stateless reward workers in their own pool.

Nothing heavy is imported here; see ``protocol`` (requests, results, the ``RewardFunction``
interface), ``registry`` (the kinds), ``rule`` and ``model`` (the kinds), ``train`` (`braid reward
train`), ``worker``/``server``/``client`` (the service and its pool client), ``scaling`` (the pure
pool-scaling policy; ``flows/reward_pool.py`` runs it). docs/reward.md.
"""
