"""Rewards: the reward functions, the math-verify worker, the code sandbox (bubblewrap where it
works), toy rewards for smoke tests.
"""
