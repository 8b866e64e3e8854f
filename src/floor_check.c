int main(void) { return 0; } /* floor_check_<floor> (meson.build): only the link matters */
