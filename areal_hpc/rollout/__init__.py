"""Generation: vLLM generator ranks and the weight transfer from trainers to them."""
