"""Attention entropy against the number of keys a row sees (``hf-attn-variants entropy``): ``measure`` holds
the computation, ``cli`` the command."""
