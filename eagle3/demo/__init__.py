"""The bundled demo corpus (`eagle3 demo-data`): ``corpus`` writes the datasets and their manifest,
``code_tasks`` holds the HumanEval-shaped code completion tasks of our own."""
