// The target that compiles cmake/precompiled.h; it has no code of its own.
