"""Fusion bisection: name the fused op that breaks tolerance, prove it, hand over a repro.

The switch is the observer effect itself: engines refuse to fuse across a
marked (output) tensor, so "fusion enabled only in region R" is the fused
engine built with every tensor outside R marked.
"""
