// empty: the emulator's types are in cuda_emu.h
