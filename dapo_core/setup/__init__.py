"""Configuration: dataclasses, presets, the ladders of arms, memory planning."""
