"""Answers from rows: cells with intervals, what one configuration is, races, comparisons, history,
scaling, stragglers, recommendations and the code to paste."""
