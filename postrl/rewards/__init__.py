"""Pure, batched reward functions and verifiers, and scoring a step's samples with them."""
