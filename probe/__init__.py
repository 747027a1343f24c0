"""``lipcast probe``: a WebRTC client that measures a lipcast server from the outside."""
