"""Rollouts: the engines that sample G completions per prompt (engines, native/), their shared
types, and one step's collection on this rank.
"""
