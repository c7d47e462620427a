//! Seeded initialisers: Glorot (Xavier) and He (Kaiming), uniform and normal.
