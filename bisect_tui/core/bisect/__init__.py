"""Fusion bisection: name the fused op that breaks tolerance, prove it, hand over a repro.

The switch is the observer effect itself: engines refuse to fuse across a
marked (output) tensor, so "fusion enabled only in region R" is the fused
engine built with every tensor outside R marked.

The search is four parts, each handed only what it needs: the strategy
(strategy.py: proposes trials, learns pass or fail), the store of trials on
record (store.py: steps.jsonl, resume), the build scheduler (scheduler.py:
the pool, prefetches and early builds) and the judge (judge.py); trials.py
turns a proposal into a judged step, records.py holds what they produce,
verdicts.py says it in words, and search.py wires them to a triage.
"""
