"""Streaming: a sequence model as one time step per call (`plan.StepPlan`),
the layers that allow it (`rules`), and the step as a function (`step`)."""
