"""The goodput draft budget: how many tokens each step drafts (``goodput``), from a step-cost
model learnt online (``step_cost``, its fitting math in ``piecewise_fit``)."""
