"""Images in, text out (issue 32): reading images on the API side, keying their placeholder
tokens in the prefix cache, and preparing their pixels for the vision tower in the scheduler."""
