"""Pure domain layer: dataclasses and functions, no I/O, no clock, no environment."""
