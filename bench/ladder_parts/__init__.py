"""The parts of bench/ladder.py: the plan of each row, and a row run for real."""
