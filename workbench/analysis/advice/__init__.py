"""Advice: the study in words (finding), the loss table (losses), the ranked changes
(ranked_advice), what a diagnosis calls for and its predictions (tune_plan: the list the tune and
the finding share) and a tune's inputs and intervals (tune_measure). The analysis's top floor:
imports every floor below it."""
