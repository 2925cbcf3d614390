"""Command line: `naiad serve` (tritonserver's flag names) and friends."""
